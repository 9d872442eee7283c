"""The wire between the server's protocols and the ClientApp: the kinds of message and the names of their records
and keys. Both sides import them from here (strategies/, server/ and clients/app.py never spell them), so a renamed
key cannot leave one side behind. Flower's own names (its "train" message type, the DP wrapper's clipping key) stay
Flower's.
"""

from __future__ import annotations

# the queries a protocol sends (Flower's message type is "query.<kind>"; "train" is Flower's MessageType.TRAIN)
HELLO = "hello"  # which party a node is; loads its partition and warms training up (the cold start)
ENCODE = "encode"  # encode the partition once and upload it
VALIDATE = "validate"  # score the central trainer's candidates on the party's own validation split
# (Flower's MessageType.EVALUATE scores a FedAvg/FedProx global model on the same split)
PERSONALIZE = "personalize"  # the central model comes back: recalibrate it on the party's own data


def query(kind: str) -> str:
    """The message type of a query `kind`, as Flower's `@app.query(kind)` handler receives it."""
    return f"query.{kind}"


# records of a message's RecordDict
CONFIG = "config"  # ConfigRecord: the run settings and the query's own keys below
ARRAYS = "arrays"  # ArrayRecord: a model's state dict (either way)
METRICS = "metrics"  # MetricRecord: a reply's numbers
UPLOAD = "upload"  # ArrayRecord: an encoded partition (x, y)
NODE = "node"  # ConfigRecord: where a ClientApp runs (its Ray node), in a hello's reply

# keys of the config record
SETTINGS = "settings"  # the run's Settings as JSON: one place (the server) reads the run config
MODE = "mode"  # train: "local-only" or "federated"
SERVER_ROUND = "server-round"
PROXIMAL_MU = "proximal-mu"
STORED_PARTIES = "stored-parties"  # encode: the parties whose upload a resumed run holds already ("0,3")
CANDIDATES = "candidates"  # validate: the candidates' names, in the order of their records
TRAINER = "trainer"  # personalize: the chosen candidate's name


def candidate(index: int) -> str:
    """The record that carries candidate `index`'s weights in a validate query."""
    return f"candidate-{index}"


# keys of a reply's metrics
PARTY = "party"  # every reply names its party
STORED = "stored"  # encode: 1 when the server holds this party's upload already (nothing re-sent)
CORRECT = "correct"  # evaluate: correct predictions on the party's validation split
COUNT = "n"  # evaluate: the split's size
