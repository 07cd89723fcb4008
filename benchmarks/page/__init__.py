"""The benchmarks page that benchmarks/report.py writes: one module per family of results, a core to
read them and write tables, and the page's assembly (docs/layout.md says which module holds what).

Nothing here runs on import.
"""
