"""Test and bench scaffolding (like ``numpy.testing``): servers and processes to run against."""
