"""One attempt of a run: the Attempt (driver.py) and what it prepares, restores, stops on and returns."""
