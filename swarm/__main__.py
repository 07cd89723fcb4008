"""`python -m swarm`: list BlockSwarm's commands (swarm/cli/programs.py); each runs as its console
script or as `python -m MODULE`."""

from swarm.cli.programs import listing

if __name__ == "__main__":
    print(listing())
