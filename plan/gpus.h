// The accelerators `mxtrain plan` knows: datasheet rates and capacities of NVIDIA data-centre
// GPUs as AWS sells them (8 per instance), and `cpu`, this machine, measured. Sources are cited
// next to each entry in gpus.cpp and in docs/plan.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mx::plan {

struct GpuSpec {
  std::string name;         // h100, h200, b200, b300, cpu
  std::string description;  // "NVIDIA H100 SXM 80 GB"
  std::string instance;     // SageMaker instance type ("" for cpu)
  int64_t gpus_per_node = 8;
  double memory_bytes = 0;     // capacity per device (decimal GB as the datasheet states)
  double bf16_flops = 0;       // dense tensor-core FLOP/s (cpu: measured fp32 SGEMM)
  double fp8_flops = 0;        // dense; 0 = not supported
  double fp4_flops = 0;        // dense NVFP4; 0 = not supported
  bool mx_formats = false;     // hardware block scaling (MXFP8 / NVFP4): Blackwell
  double hbm_bytes_per_s = 0;  // memory bandwidth per device
  double nvlink_bytes_per_s = 0;  // per direction, per device (half the bidirectional figure)
  double efa_bytes_per_s = 0;     // per node (instance), per direction
  bool is_cpu = false;
};

// UserError for an unknown name (the message lists the known ones). `cpu` measures this
// machine: MemAvailable from /proc/meminfo, SGEMM through the CPU backend (about 0.1 s).
GpuSpec find_gpu(const std::string& name);
std::vector<std::string> gpu_names();

// MFU's denominator for a device by its CUDA product name (cudaDeviceProp::name, "NVIDIA H100
// 80GB HBM3"): the dense BF16 tensor-core rate of its datasheet, in FLOP/s; 0 for a name not
// in the list (the trainer then measures a GEMM rate). Variants are told apart by the words
// of their names, not by the family alone: an H100 PCIe card (756.5 TFLOP/s) is not an H100
// SXM (989.4), a GB200 (2500) is not a B200 (2250). Case does not matter.
double datasheet_bf16_flops(const std::string& device_name);

// The parts of `cpu` that need measuring, exposed for tests.
double cpu_memory_available_bytes();  // /proc/meminfo MemAvailable (MemTotal if absent)
double cpu_memory_total_bytes();
double cpu_sgemm_flops();            // measure_sgemm_flops(make_cpu_backend())

}  // namespace mx::plan
