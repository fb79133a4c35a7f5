"""Small helpers shared by every layer: registries, nested-data traversal, seeding, rank-zero output."""

from drivetrain._utilities.apply import apply_to_collection, move_to_device
from drivetrain._utilities.rank_zero import rank_zero_only, rank_zero_print, rank_zero_warn
from drivetrain._utilities.registry import Registry, RegistryEntry
from drivetrain._utilities.seed import seed_everything

__all__ = [
    "Registry",
    "RegistryEntry",
    "apply_to_collection",
    "move_to_device",
    "rank_zero_only",
    "rank_zero_print",
    "rank_zero_warn",
    "seed_everything",
]
