"""The bootstrap node program (swarm-bootstrap): a stable DHT entry point. Not built yet."""
