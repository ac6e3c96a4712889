#include "plan/gpus.h"

#include <cctype>
#include <fstream>
#include <sstream>

#include "backend/backend.h"
#include "backend/sgemm_rate.h"
#include "core/error.h"

namespace mx::plan {

namespace {

constexpr double kGB = 1e9;
constexpr double kTFLOPS = 1e12;

// Sources (datasheet figures, dense = without 2:4 sparsity; NVIDIA quotes sparse numbers
// first, the dense rate is half):
//  H100 SXM5 80 GB: NVIDIA H100 Tensor Core GPU datasheet: BF16 1979 TFLOPS sparse (989.4
//    dense), FP8 3958 sparse (1978.9 dense), HBM3 3.35 TB/s, NVLink 4 900 GB/s bidirectional.
//    AWS ml.p5.48xlarge: 8 x H100 80 GB, 3200 Gbps EFAv2 (aws.amazon.com/ec2/instance-types/p5).
//  H200 141 GB: NVIDIA H200 datasheet: same tensor rates as H100 SXM, HBM3e 4.8 TB/s,
//    NVLink 900 GB/s. AWS ml.p5e.48xlarge: 8 x H200, 3200 Gbps EFA.
//  B200: NVIDIA HGX B200 datasheet (8 GPUs): FP4 144 PF sparse / 72 PF dense, FP8 72 PF sparse,
//    BF16 36 PF sparse -> per GPU dense: FP4 9 PF, FP8 4.5 PF, BF16 2.25 PF; HBM3e 8 TB/s;
//    NVLink 5 1.8 TB/s bidirectional. AWS P6-B200: 8 x B200 with 1440 GB HBM3e (180 GB each),
//    3200 Gbps EFAv4 (aws.amazon.com/ec2/instance-types/p6).
//  B300 (Blackwell Ultra): NVIDIA HGX B300 datasheet: FP4 144 PF sparse / 108 PF dense per 8
//    GPUs -> 13.5 PF dense each; FP8 and BF16 as B200 (72 / 36 PF sparse per 8); HBM3e 8 TB/s;
//    NVLink 5 1.8 TB/s. AWS P6-B300: 8 x B300 with 2144 GB (268 GB each, the figure in
//    DESIGN.md), 6400 Gbps EFAv4.
// Figures checked against the vendors' published tables as quoted in public write-ups
// (NVIDIA HGX B200/B300 spec table, AWS instance pages); docs/plan.md repeats them.
GpuSpec make(const char* name, const char* desc, const char* instance, double mem_gb,
             double bf16_tf, double fp8_tf, double fp4_tf, bool mx, double hbm_tb_s,
             double nvlink_bidir_gb_s, double efa_gbit_s) {
  GpuSpec g;
  g.name = name;
  g.description = desc;
  g.instance = instance;
  g.gpus_per_node = 8;
  g.memory_bytes = mem_gb * kGB;
  g.bf16_flops = bf16_tf * kTFLOPS;
  g.fp8_flops = fp8_tf * kTFLOPS;
  g.fp4_flops = fp4_tf * kTFLOPS;
  g.mx_formats = mx;
  g.hbm_bytes_per_s = hbm_tb_s * 1e12;
  g.nvlink_bytes_per_s = nvlink_bidir_gb_s * kGB / 2;
  g.efa_bytes_per_s = efa_gbit_s * 1e9 / 8;
  return g;
}

double meminfo_field(const char* field) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0 && line.size() > std::string(field).size() &&
        line[std::string(field).size()] == ':') {
      std::istringstream is(line.substr(std::string(field).size() + 1));
      double kb = 0;
      is >> kb;
      return kb * 1024.0;
    }
  }
  return 0;
}

}  // namespace

double cpu_memory_total_bytes() { return meminfo_field("MemTotal"); }

double cpu_memory_available_bytes() {
  double avail = meminfo_field("MemAvailable");
  return avail > 0 ? avail : cpu_memory_total_bytes();
}

double cpu_sgemm_flops() {
  auto be = make_cpu_backend();
  return measure_sgemm_flops(*be, 1024, 3);
}

// The product names' variants, most specific first: a name takes the first entry whose
// words it contains. Sources (dense = half the sparse figure NVIDIA quotes first):
//  H100 PCIe: H100 datasheet, BF16 1513 TFLOPS sparse; H100 NVL and H200 NVL: their
//    datasheets, 1671 sparse; GH200: Grace Hopper datasheet, 1979 sparse (the H100 SXM's);
//  GB200 and GB300: GB200 / GB300 NVL72 tables, 5 PF sparse per GPU (2.5 dense; B200 and B300
//    in HGX boards, 2.25 dense: above). H100 SXM's CUDA name is "NVIDIA H100 80GB HBM3".
double datasheet_bf16_flops(const std::string& device_name) {
  std::string n = device_name;
  for (char& ch : n) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  struct Variant {
    const char* family;
    const char* word;  // "" = any name of the family
    double tflops;
  };
  static const Variant kVariants[] = {
      {"h100", "pcie", 756.5}, {"h100", "nvl", 835.5},  {"h200", "nvl", 835.5},
      {"gh200", "", 989.4},    {"h100", "", 989.4},     {"h200", "", 989.4},
      {"gb200", "", 2500},     {"gb300", "", 2500},     {"b200", "", 2250},
      {"b300", "", 2250},
  };
  for (const Variant& v : kVariants)
    if (n.find(v.family) != std::string::npos && n.find(v.word) != std::string::npos)
      return v.tflops * kTFLOPS;
  return 0;
}

std::vector<std::string> gpu_names() { return {"h100", "h200", "b200", "b300", "cpu"}; }

GpuSpec find_gpu(const std::string& name) {
  if (name == "h100")
    return make("h100", "NVIDIA H100 SXM 80 GB", "ml.p5.48xlarge", 80, 989.4, 1978.9, 0, false,
                3.35, 900, 3200);
  if (name == "h200")
    return make("h200", "NVIDIA H200 SXM 141 GB", "ml.p5e.48xlarge", 141, 989.4, 1978.9, 0,
                false, 4.8, 900, 3200);
  if (name == "b200")
    return make("b200", "NVIDIA B200 180 GB (P6-B200)", "ml.p6-b200.48xlarge", 180, 2250, 4500,
                9000, true, 8.0, 1800, 3200);
  if (name == "b300")
    return make("b300", "NVIDIA B300 268 GB (P6-B300)", "ml.p6-b300.48xlarge", 268, 2250, 4500,
                13500, true, 8.0, 1800, 6400);
  if (name == "cpu") {
    GpuSpec g;
    g.name = "cpu";
    g.description = "this machine (CPU backend; recipes emulated in fp32)";
    g.gpus_per_node = 1 << 20;  // processes per machine: no limit
    g.memory_bytes = cpu_memory_available_bytes();
    g.bf16_flops = cpu_sgemm_flops();  // the engine's MFU denominator on CPUs
    g.hbm_bytes_per_s = 20e9;  // assumed DRAM stream rate; only the minor memory-bound term uses it
    g.nvlink_bytes_per_s = 5e9;  // shared-memory MPI between processes, assumed
    g.efa_bytes_per_s = 1.25e9;  // 10 GbE between machines, assumed
    g.is_cpu = true;
    return g;
  }
  std::string names;
  for (auto& n : gpu_names()) names += (names.empty() ? "" : ", ") + n;
  throw UserError(str("unknown --gpu '", name, "' (known: ", names, ")"));
}

}  // namespace mx::plan
