"""Swarms on one machine, for the demo, the tests and the benchmarks.

- launch.py: a swarm of real processes on this machine
- netlab.py: network namespaces as emulated hosts and regions (delays, link caps)
- delayd.py: the packet delay line a lab's router runs
- hosting.py: one in-process DHT node that serves checkpoints (honest or lying), for tests and benchmarks
- chaos.py: churn (kill and replace peers) on a local swarm
- attacks.py: lying peers, for the trust tests and benchmarks/attacks.py
- discovery.py: many DHT nodes announcing blocks as peers do, and lookups traced RPC by RPC
"""
