"""Translation between the wire APIs (issue 56): a request of one API to an upstream that speaks
another, and its answer back, through neutral forms (neutral.py) that each API reads and writes
(sides.py)."""
