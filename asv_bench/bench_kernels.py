"""Standalone kernels over path x mode x M x seq x head (1 thread: the kernel API is
single-threaded).  QK: A [M, head] x B [seq, head] codes -> C [M, seq].  SV: A [M, seq]
x B [seq, head] codes -> C [M, head].  Quantize: [seq, head] float32 -> codes (M does not
apply).  Time per call; divide M*seq*head by it for elements/s (asv_bench/kernel_rates.py
prints those rates directly)."""
import math

import numpy as np

from .common import HEADS, MODES, MS, PATHS, SEQS, Benchmark, codes, gqa, scales


class Quantize(Benchmark):
    params = [PATHS, list(MODES), SEQS, HEADS]
    param_names = ["path", "mode", "seq", "head"]

    def setup(self, path, mode, seq, head):
        self._activate(path)
        self.bits, pc = MODES[mode]
        self.scale = scales(self.rng, head, pc)
        self.x = (self.rng.standard_normal((seq, head)) * 0.5).astype(np.float32)
        self.out = gqa.quantize(self.x, self.scale, bits=self.bits)

    def time_quantize(self, path, mode, seq, head):
        gqa.quantize(self.x, self.scale, bits=self.bits, out=self.out)


class QKGemm(Benchmark):
    params = [PATHS, list(MODES), MS, SEQS, HEADS]
    param_names = ["path", "mode", "M", "seq", "head"]

    def setup(self, path, mode, m, seq, head):
        self._activate(path)
        self.bits, pc = MODES[mode]
        self.a = self.rng.standard_normal((m, head)).astype(np.float32)
        self.b = codes(self.rng, seq, head, self.bits)
        self.scale = scales(self.rng, head, pc)
        self.alpha = 1.0 / math.sqrt(head)
        self.out = np.empty((m, seq), np.float32)

    def time_qk_gemm(self, path, mode, m, seq, head):
        gqa.qk_gemm(self.a, self.b, self.scale, bits=self.bits, alpha=self.alpha, out=self.out)


class SVGemm(Benchmark):
    params = [PATHS, list(MODES), MS, SEQS, HEADS]
    param_names = ["path", "mode", "M", "seq", "head"]

    def setup(self, path, mode, m, seq, head):
        self._activate(path)
        self.bits, pc = MODES[mode]
        p = self.rng.random((m, seq)).astype(np.float32)
        self.a = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
        self.b = codes(self.rng, seq, head, self.bits)
        self.scale = scales(self.rng, head, pc)
        self.out = np.empty((m, head), np.float32)

    def time_sv_gemm(self, path, mode, m, seq, head):
        gqa.sv_gemm(self.a, self.b, self.scale, bits=self.bits, out=self.out)

