"""Every command-line program of the library (`peers/` and `bootstrap/` hold the other two).

- console.py: logging set-up, one-line errors, the conventions every command follows (-h, --version,
  --log-level, exit codes); options.py: the options every swarm command shares; config_options.py:
  click options made from a config's schema (swarm-peer's), and its options page; programs.py: the
  table of commands that `python -m swarm` lists
- train.py: swarm-train; evaluate.py: swarm-eval; generate.py: swarm-generate
- fetch.py: swarm-fetch; status.py: swarm-status; bench.py: swarm-bench; demo.py: swarm-demo
- health.py: swarm-health (the health page)
"""
