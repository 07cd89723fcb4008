"""The swarm's health page (swarm-health): follow one swarm and show it in a browser.

- state.py: one swarm's state from its records and a ping of each host: healthy or broken blocks, loss history
- checks.py: whether each host serves the checkpoint it announces (checked once per peer and checkpoint)
- app.py: the web server (aiohttp): the page, its static files, `GET /api/v1/state`
- static/: the page (HTML, CSS and the script that refreshes it in place)
- browser.py: headless Chromium for the page's test and its screenshot
"""
