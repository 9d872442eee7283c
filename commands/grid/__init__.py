"""`fedsmix grid`: run a preset's grid through Flower simulation; write table, CSV and plot.

A preset's `grid:` block names the axes: `parties` (numbers of SuperNodes) and any run setting with a
list of values (`tau`, `radius-mode`, ...). Every cell is one simulation of the preset's strategies on the
same partitions, once per seed of `seeds` (`--seeds`): the seeds are replicates, and every table cell is
their mean with a 95 % interval. A strategy is not rerun for an axis it cannot depend on: the
encoder's keys (tau, radius-mode, ...) only change mixup-union, the number of parties does not change
the centralised bound, FedAvg/FedProx keys only change those two. Their result is reused and the table
says from which cell.

Precedence, lowest first: schema defaults < the preset's keys < the preset's grid axes < `--axis`
(replaces an axis) < `--seeds` (replaces the seeds) < `--set key=value` (fixes a key everywhere, collapsing its
axis; `--set seed=N` leaves one seed).
"""

from .command import register

__all__ = ["register"]
