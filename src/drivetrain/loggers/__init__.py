"""Experiment loggers: where metrics and hyperparameters go (CSV files, TensorBoard)."""

from drivetrain.loggers.csv_logs import CSVLogger
from drivetrain.loggers.logger import Logger
from drivetrain.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]
