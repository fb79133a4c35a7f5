"""drivetrain.testing (work in progress)."""
