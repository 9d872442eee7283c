"""fedsmix: the shared library (data, encoders, models, training, metrics, config).

Never imports Flower: parties, server and benchmarks all call these plain functions.
"""

__version__ = "0.1.0"
