"""``nightbench demo`` and the small package whose history it bisects."""
