#include "graph/checkpoint/npy.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

namespace ag::models {

error save_npy(const std::string& path, const host_tensor& in) {
  const host_tensor t = in.type() == dtype::bf16 ? in.cast(dtype::f32) : in;
  const char* descr = t.type() == dtype::f32 ? "<f4" : t.type() == dtype::f16 ? "<f2" : "<i4";
  std::string shape = "(";
  for (int i = 0; i < t.dims().rank(); ++i) shape += std::to_string(t.dims()[i]) + (t.dims().rank() == 1 || i + 1 < t.dims().rank() ? "," : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // magic (6) + version (2) + header length (2) + header + '\n', padded to a multiple of 64.
  const std::size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return error{errc::invalid_argument, path + ": cannot create: " + std::strerror(errno)};
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(reinterpret_cast<const char*>(magic), 8);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                                static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.bytes()));
  out.flush();
  if (!out) return error{errc::invalid_argument, path + ": write failed"};
  return {};
}

expected<host_tensor> load_npy(const std::string& path) {
  auto fail = [&](const std::string& what) { return error{errc::invalid_argument, path + ": " + what}; };
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(std::string("cannot open: ") + std::strerror(errno));
  unsigned char head[10];
  if (!in.read(reinterpret_cast<char*>(head), 10) || std::memcmp(head, "\x93NUMPY", 6) != 0 || head[6] != 1)
    return fail("not a version 1 .npy file");
  const std::size_t hlen = head[8] | (static_cast<std::size_t>(head[9]) << 8);
  std::string header(hlen, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(hlen))) return fail("truncated header");
  dtype type;
  if (header.find("'descr': '<f4'") != std::string::npos) type = dtype::f32;
  else if (header.find("'descr': '<f2'") != std::string::npos) type = dtype::f16;
  else if (header.find("'descr': '<i4'") != std::string::npos) type = dtype::i32;
  else return fail("dtype is not <f4, <f2 or <i4");
  if (header.find("'fortran_order': False") == std::string::npos) return fail("not in C order");
  const auto open = header.find("'shape': (");
  const auto close = open == std::string::npos ? open : header.find(')', open);
  if (close == std::string::npos) return fail("no shape");
  std::vector<int64_t> dims;
  const std::string list = header.substr(open + 10, close - open - 10);
  std::size_t i = 0;
  while (i < list.size()) {
    while (i < list.size() && (list[i] == ' ' || list[i] == ',')) ++i;
    if (i >= list.size()) break;
    int64_t d = 0;
    std::size_t digits = 0;
    while (i < list.size() && list[i] >= '0' && list[i] <= '9' && digits < 15) d = d * 10 + (list[i++] - '0'), ++digits;
    if (digits == 0) return fail("bad shape (" + list + ")");
    dims.push_back(d);
  }
  if (dims.empty() || dims.size() > 4) return fail("rank " + std::to_string(dims.size()) + " is outside 1..4");
  shape s = shape::from_range(dims.begin(), dims.end());
  host_tensor t = host_tensor::uninitialized(type, s);
  if (!in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.bytes()))) return fail("truncated data");
  return t;
}

}  // namespace ag::models
