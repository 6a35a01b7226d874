"""nbgrader configuration: the course root is the repository root.

Instructor workflow (run from the repository root):

    nbgrader generate_assignment 01_paged_kv --force   # solutions/ -> phases/
    nbgrader autograde 01_paged_kv                      # grades submitted/<student>/01_paged_kv/
    nbgrader generate_feedback 01_paged_kv              # -> feedback/<student>/01_paged_kv/

`python -m labs.course release` regenerates every notebook in phases/ (and normalizes it);
`python -m labs.course check` reports drift between solutions/ and phases/.
"""

import os
import warnings

# nbgrader's gradebook models trip SQLAlchemy's relationship-overlap warning (SAWarning) on every command;
# it is nbgrader's own and harmless: silence it here, where every nbgrader command loads this file.
try:
    from sqlalchemy.exc import SAWarning
except ImportError:  # nbgrader not installed: nothing to silence
    pass
else:
    warnings.filterwarnings("ignore", category=SAWarning)

c = get_config()  # noqa: F821  (injected by traitlets when nbgrader loads this file)

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "mini"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "phases"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

# Learners see this stub in place of each solution (the grader treats it as "not implemented yet").
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# A CPU-only laptop: give each cell plenty of time when autograding.
c.ExecutePreprocessor.timeout = 300
c.Execute.timeout = 300
c.Execute.interrupt_on_timeout = True
