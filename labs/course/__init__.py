"""Mirrors no vllm/v1 file: the course pipeline (nbgrader release, notebook format, answer loading).

- `labs.course.release`: solutions/ -> phases/ with nbgrader, and the drift check;
- `labs.course.notebook_format`: how notebooks are stored (nbformat 4.5, no outputs, kernel python3);
- `labs.course.answers`: read a learner's answer cells out of a notebook without running it;
- `labs.course.authoring`: small helpers to build nbgrader cells when writing a phase.
"""
