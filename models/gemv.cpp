// y = x W^T + b for a few rows x (M, in) and a weight as nn.Linear stores it, W (out, in): the matrix products of a
// decoding step (models/gemv.py says when they run here). With one new token a product does 2 flops per weight it
// reads, so it is bound by how fast the weight streams from memory. Each thread takes a contiguous range of W's rows
// and reads it once, front to back; a block of four rows is dotted with every row of x while it is in the L1/L2
// cache. Built with -mavx2 -mfma: 8-wide fused multiply-adds, four independent accumulators.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

inline float horizontal_sum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_hadd_ps(sum, sum);
  sum = _mm_hadd_ps(sum, sum);
  return _mm_cvtss_f32(sum);
}

// Rows [first, last) of W against every row of x, into y (M, out).
void weight_rows(const float* __restrict w, const float* __restrict x, const float* __restrict bias,
                 float* __restrict y, int64_t first, int64_t last, int64_t in, int64_t out, int64_t rows_of_x) {
  int64_t r = first;
  for (; r + 4 <= last; r += 4) {
    const float* w0 = w + r * in;
    const float* w1 = w0 + in;
    const float* w2 = w1 + in;
    const float* w3 = w2 + in;
    for (int64_t m = 0; m < rows_of_x; ++m) {
      const float* xm = x + m * in;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 8 <= in; i += 8) {
        const __m256 xi = _mm256_loadu_ps(xm + i);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + i), xi, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + i), xi, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + i), xi, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + i), xi, a3);
      }
      float s0 = horizontal_sum(a0), s1 = horizontal_sum(a1), s2 = horizontal_sum(a2), s3 = horizontal_sum(a3);
      for (; i < in; ++i) {
        s0 += w0[i] * xm[i];
        s1 += w1[i] * xm[i];
        s2 += w2[i] * xm[i];
        s3 += w3[i] * xm[i];
      }
      float* ym = y + m * out + r;
      ym[0] = s0 + (bias ? bias[r] : 0.f);
      ym[1] = s1 + (bias ? bias[r + 1] : 0.f);
      ym[2] = s2 + (bias ? bias[r + 2] : 0.f);
      ym[3] = s3 + (bias ? bias[r + 3] : 0.f);
    }
  }
  for (; r < last; ++r) {
    for (int64_t m = 0; m < rows_of_x; ++m) {
      float s = 0.f;
      for (int64_t i = 0; i < in; ++i) s += w[r * in + i] * x[m * in + i];
      y[m * out + r] = s + (bias ? bias[r] : 0.f);
    }
  }
}

}  // namespace

// x (M, in), weight (out, in), bias (out,) or empty: contiguous fp32 CPU tensors (models/gemv.py checks) -> (M, out).
torch::Tensor linear_rows(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1),
              "linear_rows: x (M, in) and weight (out, in) expected, got ", x.sizes(), " and ", weight.sizes());
  TORCH_CHECK(x.is_cpu() && weight.is_cpu() && bias.is_cpu(), "linear_rows: CPU tensors");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous() && bias.is_contiguous(), "linear_rows: contiguous inputs");
  TORCH_CHECK(x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat &&
              bias.scalar_type() == torch::kFloat, "linear_rows: fp32 inputs");
  TORCH_CHECK(bias.numel() == 0 || bias.numel() == weight.size(0), "linear_rows: bias of ", bias.numel(),
              " values for ", weight.size(0), " outputs");
  const int64_t rows_of_x = x.size(0), in = x.size(1), out = weight.size(0);
  auto y = torch::empty({rows_of_x, out}, x.options());
  const float* w = weight.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* b = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // At least 64 rows a task: below that, waking a second thread costs more than the rows take to stream.
  at::parallel_for(0, out, 64, [=](int64_t first, int64_t last) {
    weight_rows(w, xp, b, yp, first, last, in, out, rows_of_x);
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_rows", &linear_rows, "y = x W^T + b for a few rows x, W (out, in) as stored");
}
