"""What is running and what is late: ``GET /api/status`` and ``nightbench status``."""
