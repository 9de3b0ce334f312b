"""numpy scalars where a kernel, a library helper or sg.memset takes a scalar, as a launch converts
them (DType.scalar): a float parameter takes numpy floats and integers, an int one numpy integers."""

import numpy as np

import scopegraph as sg
from scopegraph import library

dev = sg.device("host")
stream = dev.stream()
x = dev.zeros((16,))
y = dev.zeros((16,))
count = dev.zeros((4,), sg.i32)

stream.run(library.axpy[1, 16](y.mut(), x, np.float32(0.5), np.int32(16)))
stream.run(library.axpy[1, 16](y.mut(), x, np.float64(2.0), np.int64(16)))
stream.run(library.add_scalar[1, 16](y.mut(), np.int16(3), 16))
stream.run(library.axpy_op(y.mut(), x, np.float32(1.5)))
stream.run(library.add_scalar_op(y.mut(), np.int64(1)))
stream.run(library.rms_norm_op(y.view((1, 16)).mut(), x.view((1, 16)), x, np.float32(1e-5)))
stream.run(sg.memset(y.mut(), np.float32(4.0)))
stream.run(sg.memset(count.mut(), np.int32(7)))
