"""The course kit (docs/course.md): the exercises marked in the working code, and the grader.

  exercises    finds the marked bodies, writes the student copy with every exercise blanked
  grade        runs each exercise's own tests, one row each (pytest, the [test] extra)

May import only the standard library (and pytest, inside grade); grid/jobs reads an exercise's
stub error from exercises.
"""
