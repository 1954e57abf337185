#include "worker/checkpoint/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status.h"

namespace dsv4 {
namespace {

constexpr uint64_t kMaxHeaderBytes = 256ull << 20;  // real headers are a few MiB
constexpr size_t kMaxRank = 8;

absl::Status Corrupt(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors: ", AV(what)));
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A shard name from the index must be a plain file name inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(const uint8_t* data, size_t size,
                                                               uint64_t* data_start) {
  if (size < 8) return Corrupt(absl::StrCat("file is ", size, " bytes; too short for a header"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > kMaxHeaderBytes) {
    return Corrupt(absl::StrCat("header length ", header_len, " is implausibly large"));
  }
  if (header_len > size - 8) {
    return Corrupt(absl::StrCat("header length ", header_len, " exceeds the file (", size,
                                " bytes): truncated?"));
  }
  *data_start = 8 + header_len;
  const uint64_t data_size = size - *data_start;
  const std::string_view text(reinterpret_cast<const char*>(data + 8), header_len);
  ASSIGN_OR_RETURN(Json header, ParseJson(text, "safetensors header"));
  if (!header.is_object()) return Corrupt("header is not a JSON object");

  std::vector<TensorInfo> tensors;
  tensors.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    const std::string quoted = absl::StrCat("tensor \"", absl::CEscape(name), "\"");
    if (name == "__metadata__") {
      if (!entry.is_object()) return Corrupt("__metadata__ must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return Corrupt("__metadata__ must be an object of strings");
      }
      continue;
    }
    if (name.empty()) return Corrupt("empty tensor name");
    if (!entry.is_object()) return Corrupt(absl::StrCat(quoted, ": entry is not an object"));
    for (const auto& [k, v] : entry.items()) {
      if (k != "dtype" && k != "shape" && k != "data_offsets") {
        return Corrupt(absl::StrCat(quoted, ": unexpected field \"", absl::CEscape(k), "\""));
      }
    }
    TensorInfo t;
    t.name = name;
    auto dt = entry.find("dtype");
    if (dt == entry.end() || !dt->is_string()) {
      return Corrupt(absl::StrCat(quoted, ": missing dtype"));
    }
    const auto parsed = ParseDType(dt->get<std::string>());
    if (!parsed.has_value()) {
      return Corrupt(absl::StrCat(quoted, ": unsupported dtype \"",
                                  absl::CEscape(dt->get<std::string>()), "\""));
    }
    t.dtype = *parsed;
    auto shape = entry.find("shape");
    if (shape == entry.end() || !shape->is_array() || shape->size() > kMaxRank) {
      return Corrupt(absl::StrCat(quoted, ": shape must be a list of at most ", kMaxRank, " sizes"));
    }
    // numel * element size must fit comfortably in 63 bits.
    unsigned __int128 bytes = static_cast<unsigned>(DTypeSize(t.dtype));
    for (const auto& d : *shape) {
      if (!d.is_number_unsigned()) {
        return Corrupt(absl::StrCat(quoted, ": shape entries must be non-negative integers"));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40)) return Corrupt(absl::StrCat(quoted, ": dimension too large"));
      t.shape.push_back(static_cast<int64_t>(dim));
      bytes *= dim;
      if (bytes > (static_cast<unsigned __int128>(1) << 62)) {
        return Corrupt(absl::StrCat(quoted, ": tensor too large"));
      }
    }
    auto offsets = entry.find("data_offsets");
    if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return Corrupt(absl::StrCat(quoted, ": data_offsets must be [begin, end]"));
    }
    const uint64_t begin = (*offsets)[0].get<uint64_t>();
    const uint64_t end = (*offsets)[1].get<uint64_t>();
    if (begin > end) return Corrupt(absl::StrCat(quoted, ": data_offsets begin > end"));
    if (end > data_size) {
      return Corrupt(absl::StrCat(quoted, ": bytes [", begin, ", ", end,
                                  ") run past the end of the data (", data_size,
                                  " bytes): truncated file?"));
    }
    if (end - begin != static_cast<uint64_t>(bytes)) {
      return Corrupt(absl::StrCat(quoted, ": shape x ", AV(DTypeName(t.dtype)), " needs ",
                                  static_cast<uint64_t>(bytes), " bytes but data_offsets span ",
                                  end - begin));
    }
    t.begin = begin;
    t.nbytes = end - begin;
    tensors.push_back(std::move(t));
  }
  // Non-empty byte ranges must not overlap.
  std::vector<const TensorInfo*> sorted;
  for (const auto& t : tensors) {
    if (t.nbytes > 0) sorted.push_back(&t);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->begin < sorted[i - 1]->begin + sorted[i - 1]->nbytes) {
      return Corrupt(absl::StrCat("tensors \"", absl::CEscape(sorted[i - 1]->name), "\" and \"",
                                  absl::CEscape(sorted[i]->name), "\" overlap"));
    }
  }
  return tensors;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = path;
  if (IsFile(path)) {
    RETURN_IF_ERROR(ckpt->AddFile(path));
    return ckpt;
  }
  if (!IsDirectory(path)) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", path, " does not exist"));
  }
  const std::string index_path = absl::StrCat(path, "/model.safetensors.index.json");
  const std::string single_path = absl::StrCat(path, "/model.safetensors");
  if (IsFile(index_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path, 256 << 20));
    auto index = ParseJson(text, index_path);
    if (!index.ok()) return index.status();
    auto map = index->is_object() ? index->find("weight_map") : index->end();
    if (map == index->end() || !map->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing weight_map object"));
    }
    std::map<std::string, std::string> expected;  // tensor -> shard
    std::vector<std::string> shards;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string() || !IsPlainFileName(file.get<std::string>())) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[\"",
                                                       absl::CEscape(name),
                                                       "\"] must be a file name in ", path));
      }
      expected[name] = file.get<std::string>();
      if (std::find(shards.begin(), shards.end(), file.get<std::string>()) == shards.end()) {
        shards.push_back(file.get<std::string>());
      }
    }
    if (shards.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map is empty"));
    }
    for (const auto& shard : shards) {
      RETURN_IF_ERROR_CTX(ckpt->AddFile(absl::StrCat(path, "/", shard)), index_path);
    }
    for (const auto& [name, shard] : expected) {
      const TensorInfo* t = ckpt->Find(name);
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor ", name,
                                                       " is mapped to ", shard,
                                                       " but that shard does not hold it"));
      }
      const std::string& actual = ckpt->files_[t->file].path();
      if (actual.size() < shard.size() || actual.substr(actual.size() - shard.size()) != shard) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor ", name,
                                                       " is mapped to ", shard, " but found in ",
                                                       actual));
      }
    }
    if (expected.size() != ckpt->tensors_.size()) {
      LogWarning("checkpoint_unindexed_tensors",
                 {{"index", index_path},
                  {"indexed", expected.size()},
                  {"in_shards", ckpt->tensors_.size()}});
    }
    return ckpt;
  }
  if (IsFile(single_path)) {
    RETURN_IF_ERROR(ckpt->AddFile(single_path));
    return ckpt;
  }
  return absl::NotFoundError(absl::StrCat("no model.safetensors or model.safetensors.index.json in ",
                                          path));
}

absl::Status Checkpoint::AddFile(const std::string& file_path) {
  ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(file_path));
  uint64_t data_start = 0;
  auto parsed = ParseSafetensorsHeader(file.data(), file.size(), &data_start);
  if (!parsed.ok()) return Annotate(parsed.status(), file_path);
  const int index = static_cast<int>(files_.size());
  for (TensorInfo& t : *parsed) {
    if (by_name_.count(t.name) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(file_path, ": tensor ", t.name,
                                                     " also appears in ",
                                                     files_[tensors_[by_name_[t.name]].file].path()));
    }
    t.file = index;
    by_name_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  files_.push_back(std::move(file));
  data_start_.push_back(data_start);
  return absl::OkStatus();
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

TensorBytes Checkpoint::Bytes(const TensorInfo& info) const {
  return TensorBytes{&info, files_[info.file].data() + data_start_[info.file] + info.begin};
}

}  // namespace dsv4
