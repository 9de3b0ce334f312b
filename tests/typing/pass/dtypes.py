import scopegraph as sg

# DESIGN.md section 1: dtype aliases compare equal to the dtypes they name, and mypy --strict
# accepts the comparison (no comparison-overlap between DType and the alias's type[float]).
t = sg.device("host").zeros((4,), sg.f32)
same: bool = t.dtype == sg.f32
also: bool = sg.f32 == t.dtype
other: bool = t.dtype != sg.i32
named: bool = t.dtype == sg.float32
