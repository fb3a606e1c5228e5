"""dapo-suite: DAPO (Decoupled Clip and Dynamic sAmpling Policy Optimization) end to end."""

__version__ = "0.1.0"
