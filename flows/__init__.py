"""Prefect flows and tasks of the learning loop; each task body is a call into reef/."""
