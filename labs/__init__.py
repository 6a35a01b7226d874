"""The course labs: one pytest suite per phase (labs/test_pNN_*.py) and the checks they share with the
notebooks' nbgrader test cells (labs/checks/pNN.py). See labs/README.md."""
