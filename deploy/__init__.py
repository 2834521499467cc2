"""Moving accepted releases into running engines, always verified before the head moves."""
