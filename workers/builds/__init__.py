"""Build providers and the environments a build under test is measured in."""
