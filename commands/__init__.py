"""Command line and orchestration: `fedsmix ...`, the `flwr run` driver, the in-process
launcher, grids and the frontier. Imports run one way: commands -> server/strategies/clients -> fedsmix."""
