"""The course kit (docs/course.md): the exercises marked in the working code, and the grader.

  exercises    finds the marked bodies, writes the student copy with every exercise blanked,
               puts reference bodies back (--restore)
  copy         which copy a command is about, and whether Python imports that copy's code;
               what a student copy leaves out
  grade        each exercise's own tests in a process of its own, one row each
  child        that process: imports the copy's minialign only, runs pytest (the [test] extra)
  classes      every copy of a folder graded into one CSV, with points.csv's points

May import only the standard library (and pytest, inside grade and child); grid/jobs reads an
exercise's stub error from exercises; machinery/grading.py is grade's command line.
"""
