"""The Trainer's loops: fit (training with validation), evaluation (validate, test) and prediction."""
