#pragma once

/// \file
/// A GPU's peak arithmetic rate for a precision mode, from the vendor's
/// datasheet: the denominator of model FLOPs utilisation (MFU), which
/// train_gpt reports as nanoGPT and PaLM define it.

#include <string>

#include "lamp/amp/precision.h"

namespace lamp {

/// The dense (no sparsity) peak in FLOP/s of the GPU named `device_name`
/// (as torch::cuda's device properties give it) for the matrix products of
/// `precision`, from NVIDIA's datasheets, for the GPUs lamp is measured on:
///
/// | GPU | fp32 | tf32 | amp, half (FP16) | amp-bf16, bf16, fp8 (BF16) |
/// |---|---|---|---|---|
/// | H100 SXM ("NVIDIA H100 80GB HBM3"), H200 SXM ("NVIDIA H200"), GH200 | 66.9 T | 494.7 T | 989.4 T | 989.4 T |
/// | H100 PCIe ("NVIDIA H100 PCIe") | 51.2 T | 378 T | 756 T | 756 T |
/// | A100, SXM4 and PCIe ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe") | 19.5 T | 156 T | 312 T | 312 T |
///
/// A model is recognised by a whole word of the name (words end at spaces,
/// '-' and '_', case aside): "NVIDIA RTX A1000 6GB Laptop GPU" is not an
/// A100. The NVL boards ("NVIDIA H100 NVL", "NVIDIA H200 NVL") run at other
/// clocks than the SXM parts and are not in the table, nor are MIG slices
/// (a name with the word "MIG"), which have a share of the chip's units.
///
/// fp8 is held against the BF16 peak: only the Linear layers' products run
/// in FP8, the rest (attention, the head) in BF16; its FP8 peak is twice
/// that. 0 for any other device or precision (kAuto, which is resolved
/// first): a CPU, whose peak depends on its clock and cores, or a GPU not
/// in the table; the programs then take `--peak-tflops`.
double peak_flops(const std::string& device_name, Precision precision);

} // namespace lamp
