"""The bootstrap program, swarm-bootstrap (main.py): a stable DHT entry point that can create a swarm."""
