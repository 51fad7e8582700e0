"""rackwise: the command-line client for Rackwise (README, "For ML engineers")."""

__version__ = "0.1.0"
