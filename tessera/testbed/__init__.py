"""Test hosts and faults for Tessera's reliability harness (issue 15).

- `control`: what every fleet the chaos and soak harnesses drive must offer
  (`FleetControl`): process faults, network faults, Redis, stats.
- the loopback fleet (every process on 127.0.0.1) and the network-namespace fleet (one
  namespace per host, a bridge, real DNS, tc netem) both implement it.

Nothing here is imported by the services; tests and benchmarks import it.
"""
