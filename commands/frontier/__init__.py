"""The privacy-utility-cost frontier: every strategy on one table, attacked on the same victims.

plan (what to run) -> one Flower simulation, every row a real run (accuracy, bytes, wall time)
-> cases (the victim's upload or first-round update, replayed) -> attacks -> report.
"""
