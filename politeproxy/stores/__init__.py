"""Stores keep the schedule and per-host state; the pacer never knows which one it has."""
