"""Fleets of real processes for tests, benchmarks and the fault harness (issue 15).

- `control`: what the chaos and soak harnesses need of a fleet (`FleetControl`):
  process faults, network faults, Redis, addresses.
- `fleet`: the role plan and process faults; `LoopbackFleet` runs everything on
  127.0.0.1.
- `netfleet`: `NetFleet`, the same fleet on test hosts: a network namespace per process
  (`hosts`), replicas found through dnsmasq (`dns`), links delayed, dropped or cut by a
  userspace switch (`wire`, `links`; the kernels here have no netem).
- `leaks`: what a fleet at rest must not hold. `media`: seeded test images.

Nothing here is imported by the services; tests and benchmarks import it.
"""
