"""Mirrors no vllm/v1 file: the course pipeline (nbgrader release, notebook format, answer loading).

- `mini.course.release`: solutions/ -> phases/ with nbgrader, and the drift check;
- `mini.course.notebook_format`: how notebooks are stored (nbformat 4.5, no outputs, kernel python3);
- `mini.course.answers`: read a learner's answer cells out of a notebook without running it;
- `mini.course.authoring`: small helpers to build nbgrader cells when writing a phase.
"""
