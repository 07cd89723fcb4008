"""Every command-line program of the library (`peers/` and `bootstrap/` hold the other two).

- console.py: logging set-up and one-line errors; options.py: the options every swarm command shares
- train.py: swarm-train; evaluate.py: swarm-eval; generate.py: swarm-generate
- fetch.py: swarm-fetch; status.py: swarm-status; bench.py: swarm-bench; demo.py: swarm-demo
- health.py: swarm-health (the health page)
"""
