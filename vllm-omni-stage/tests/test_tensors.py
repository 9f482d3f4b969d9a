"""The worker's tensor conversions on the shapes vllm-omni's output
processor hands out (here with the stand-in's tensors, which have
``.tolist()``; torch's ``.numpy()`` path needs a GPU run)."""

from __future__ import annotations

import struct
import unittest

from omnipd_stage import tensors

from .support import toy


def f32(*v: float) -> bytes:
    return struct.pack("<%df" % len(v), *v)


class TensorsTest(unittest.TestCase):
    def test_rows_of_a_tensor_and_of_per_step_pieces_agree(self) -> None:
        whole = toy.Tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
        pieces = [toy.Tensor([[1.0, 2.0], [3.0, 4.0]]), toy.Tensor([[5.0, 6.0]])]
        self.assertEqual(tensors.rows(whole), (3, 2, f32(1, 2, 3, 4, 5, 6)))
        self.assertEqual(tensors.rows(pieces), tensors.rows(whole))
        self.assertEqual(tensors.rows(toy.Tensor([[[1.0, 2.0], [3.0, 4.0]]]))[:2], (2, 2))  # [1, T, H]

    def test_vector_takes_the_last_of_accumulated_steps(self) -> None:
        self.assertEqual(tensors.vector(toy.Tensor([[[1.0, 2.0]], [[3.0, 4.0]]])), (2, f32(3, 4)))
        self.assertEqual(tensors.vector([toy.Tensor([[1.0, 2.0]]), toy.Tensor([[3.0, 4.0]])]), (2, f32(3, 4)))
        self.assertEqual(tensors.vector(toy.Tensor([1.0, 2.0])), (2, f32(1, 2)))

    def test_ints_and_samples(self) -> None:
        self.assertEqual(tensors.int_rows([toy.Tensor([[1, 2]]), toy.Tensor([[3, 4]])]), [[1, 2], [3, 4]])
        self.assertEqual(tensors.samples(toy.Tensor([[0.5, -0.5]])), f32(0.5, -0.5))
        self.assertEqual(tensors.engine_rows(f32(1, 2, 3, 4), 2, 2), [[1.0, 2.0], [3.0, 4.0]])


if __name__ == "__main__":
    unittest.main()
