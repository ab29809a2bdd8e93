#include "core/model/profile.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "core/model/model.h"
#include "core/support/json.h"
#include "platforms/platform.h"

namespace moelite {

void LinearMap::apply(const float* x, float* scores) const {
  const size_t stride = static_cast<size_t>(n_in) + 1;
  for (int32_t r = 0; r < rows; ++r) {
    const float* wr = w.data() + static_cast<size_t>(r) * stride;
    double acc = wr[n_in];
    for (int32_t c = 0; c < n_in; ++c) acc += static_cast<double>(wr[c]) * x[c];
    scores[r] = static_cast<float>(acc);
  }
}

namespace {

constexpr char kFormat[] = "moelite-profile";
constexpr char kWeightsMagic[4] = {'M', 'L', 'P', 'W'};

Status bad(const std::string& path, const std::string& what) {
  return fail(MOELITE_ERR_BAD_PROFILE, "calibration profile '%s': %s", path.c_str(), what.c_str());
}

std::string join(const std::vector<double>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + json::number(v[i]);
  return o + "]";
}

std::string join(const std::vector<uint64_t>& v) {
  std::string o = "[";
  for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + std::to_string(v[i]);
  return o + "]";
}

Status read_whole(const std::string& path, std::string* out) {
  return platform::read_whole_file(path, "calibration profile", UINT64_MAX, out);
}

// One named float array of the weights file.
struct TensorRef {
  std::string name;
  int64_t rows = 0, cols = 0;
  uint64_t offset = 0;
};

// Reads numbers with range checks; every failure names the field.
class Fields {
 public:
  Fields(const std::string& path) : path_(path) {}
  Status integer(const json::Value& obj, const char* key, int64_t lo, int64_t hi, int64_t* out) const {
    const json::Value* v = obj.find(key);
    if (!v || !v->is_number() || v->number != std::floor(v->number) || v->number < double(lo) || v->number > double(hi))
      return bad(path_, std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
    *out = static_cast<int64_t>(v->number);
    return MOELITE_OK;
  }
  Status real(const json::Value& obj, const char* key, double* out, bool required = true) const {
    const json::Value* v = obj.find(key);
    if (!v) {
      if (required) return bad(path_, std::string("'") + key + "' is missing");
      return MOELITE_OK;
    }
    if (v->kind == json::Value::Kind::Null) {  // written for non-finite values
      *out = std::numeric_limits<double>::quiet_NaN();
      return MOELITE_OK;
    }
    if (!v->is_number()) return bad(path_, std::string("'") + key + "' must be a number");
    *out = v->number;
    return MOELITE_OK;
  }
  Status reals(const json::Value& v, size_t n, const char* what, std::vector<double>* out) const {
    if (!v.is_array() || v.array.size() != n)
      return bad(path_, std::string("'") + what + "' must be an array of " + std::to_string(n) + " numbers");
    out->clear();
    for (const json::Value& x : v.array) {
      if (x.kind == json::Value::Kind::Null)
        out->push_back(std::numeric_limits<double>::quiet_NaN());
      else if (x.is_number())
        out->push_back(x.number);
      else
        return bad(path_, std::string("'") + what + "' must hold numbers");
    }
    return MOELITE_OK;
  }

 private:
  const std::string& path_;
};

}  // namespace

Status Profile::save(const std::string& path) const {
  // Weights first, so a profile never names a weights file that is not there.
  std::vector<TensorRef> refs;
  std::vector<float> blob;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, const std::vector<float>& data) {
    refs.push_back({name, rows, cols, blob.size() * sizeof(float)});
    blob.insert(blob.end(), data.begin(), data.end());
  };
  if (!first_layer.empty()) add("first_layer", first_layer.rows, first_layer.n_in + 1, first_layer.w);
  for (size_t l = 0; l < learned.size(); ++l)
    if (!learned[l].empty()) add("learned." + std::to_string(l), learned[l].rows, learned[l].n_in + 1, learned[l].w);
  for (size_t l = 0; l < correlation.size(); ++l)
    if (!correlation[l].empty()) add("correlation." + std::to_string(l), n_expert, n_expert, correlation[l]);
  const std::string weights_path = path + ".bin";
  std::string weights_name =
      weights_path.substr(weights_path.find_last_of('/') == std::string::npos ? 0 : weights_path.find_last_of('/') + 1);
  if (!refs.empty()) {
    std::string bytes(kWeightsMagic, 4);
    const uint32_t version = kVersion;
    bytes.append(reinterpret_cast<const char*>(&version), 4);
    bytes.append(reinterpret_cast<const char*>(blob.data()), blob.size() * sizeof(float));
    const platform::WritePiece piece{bytes.data(), bytes.size()};
    MOELITE_TRY(platform::write_file_atomic(weights_path, &piece, 1));
  }

  std::ostringstream o;
  o << "{\n  \"format\": \"" << kFormat << "\",\n  \"version\": " << kVersion << ",\n";
  o << "  \"model\": {\"arch\": " << json::quote(arch) << ", \"n_layer\": " << n_layer << ", \"n_expert\": " << n_expert
    << ", \"n_expert_used\": " << n_expert_used << ", \"n_embd\": " << n_embd << "},\n";
  o << "  \"calibration\": {\"tokens\": " << n_tokens << ", \"window\": " << window;
  if (sensitivity_tokens > 0) o << ", \"sensitivity_tokens\": " << sensitivity_tokens;
  o << "},\n";
  o << "  \"layers\": [\n";
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerProfile& lp = layers[l];
    o << "    {\"layer\": " << l << ", \"sensitivity\": " << json::number(lp.sensitivity)
      << ", \"sensitivity_fd\": " << json::number(lp.sensitivity_fd)
      << ", \"mean_tail_weight\": " << json::number(lp.mean_tail_weight);
    // Both are optional when reading (a profile may lack them); an empty one is left out, since
    // the reader takes a present array only at its full length.
    if (!lp.expert_counts.empty()) o << ",\n     \"expert_counts\": " << join(lp.expert_counts);
    if (!lp.hit_curve.empty()) o << ",\n     \"hit_curve\": " << join(lp.hit_curve);
    o << "}" << (l + 1 < layers.size() ? ",\n" : "\n");
  }
  o << "  ],\n  \"gating\": [";
  for (size_t i = 0; i < gating.size(); ++i)
    o << (i ? ",\n    " : "\n    ") << "{\"threshold\": " << json::number(gating[i].threshold)
      << ", \"experts_per_token\": " << json::number(gating[i].experts_per_token)
      << ", \"share_reduced\": " << json::number(gating[i].share_reduced) << "}";
  o << (gating.empty() ? "],\n" : "\n  ],\n");
  o << "  \"predictor_accuracy\": {";
  size_t i = 0;
  for (const auto& kv : accuracy) o << (i++ ? ",\n    " : "\n    ") << json::quote(kv.first) << ": " << join(kv.second);
  o << (accuracy.empty() ? "},\n" : "\n  },\n");
  o << "  \"learned_stride\": " << learned_stride << ",\n";
  o << "  \"weights_file\": " << (refs.empty() ? std::string("null") : json::quote(weights_name)) << ",\n";
  o << "  \"tensors\": [";
  for (size_t t = 0; t < refs.size(); ++t)
    o << (t ? ",\n    " : "\n    ") << "{\"name\": " << json::quote(refs[t].name) << ", \"rows\": " << refs[t].rows
      << ", \"cols\": " << refs[t].cols << ", \"offset\": " << refs[t].offset << "}";
  o << (refs.empty() ? "]\n}\n" : "\n  ]\n}\n");
  const std::string text = o.str();
  const platform::WritePiece piece{text.data(), text.size()};
  return platform::write_file_atomic(path, &piece, 1);
}

namespace {

// The format and version, then the model the profile was made for and how it was calibrated.
Status read_model(Fields& f, const std::string& path, const json::Value& root, Profile* p) {
  const json::Value* format = root.find("format");
  if (!format || !format->is_string() || format->string != kFormat)
    return bad(path, "'format' is not \"moelite-profile\" (not a moelite calibration profile)");
  int64_t version;
  MOELITE_TRY(f.integer(root, "version", 0, 1 << 20, &version));
  if (version != Profile::kVersion)
    return bad(path, "version " + std::to_string(version) + " is not supported (this build reads version " +
                         std::to_string(Profile::kVersion) + ")");
  const json::Value* model = root.find("model");
  if (!model || !model->is_object()) return bad(path, "'model' is missing");
  const json::Value* arch = model->find("arch");
  if (!arch || !arch->is_string()) return bad(path, "'model.arch' must be a string");
  p->arch = arch->string;
  int64_t v;
  MOELITE_TRY(f.integer(*model, "n_layer", 1, MOELITE_MAX_LAYERS, &v));
  p->n_layer = static_cast<int32_t>(v);
  MOELITE_TRY(f.integer(*model, "n_expert", 1, MOELITE_MAX_EXPERTS, &v));
  p->n_expert = static_cast<int32_t>(v);
  MOELITE_TRY(f.integer(*model, "n_expert_used", 1, p->n_expert, &v));
  p->n_expert_used = static_cast<int32_t>(v);
  MOELITE_TRY(f.integer(*model, "n_embd", 1, MOELITE_MAX_WIDTH, &v));
  p->n_embd = static_cast<int32_t>(v);
  if (const json::Value* cal = root.find("calibration")) {
    if (cal->find("tokens")) MOELITE_TRY(f.integer(*cal, "tokens", 0, INT64_MAX / 2, &p->n_tokens));
    if (cal->find("window")) {
      MOELITE_TRY(f.integer(*cal, "window", 0, 1 << 24, &v));
      p->window = static_cast<int32_t>(v);
    }
    if (cal->find("sensitivity_tokens"))
      MOELITE_TRY(f.integer(*cal, "sensitivity_tokens", 0, INT64_MAX / 2, &p->sensitivity_tokens));
  }
  return MOELITE_OK;
}

// Per layer: sensitivities, expert use counts and the LRU hit curve.
Status read_layers(Fields& f, const std::string& path, const json::Value& root, Profile* p) {
  const json::Value* layers = root.find("layers");
  if (!layers || !layers->is_array() || layers->array.size() != static_cast<size_t>(p->n_layer))
    return bad(path, "'layers' must be an array of n_layer (" + std::to_string(p->n_layer) + ") objects");
  p->layers.resize(static_cast<size_t>(p->n_layer));
  for (size_t l = 0; l < layers->array.size(); ++l) {
    const json::Value& jl = layers->array[l];
    LayerProfile& lp = p->layers[l];
    if (!jl.is_object()) return bad(path, "layers[" + std::to_string(l) + "] is not an object");
    MOELITE_TRY(f.real(jl, "sensitivity", &lp.sensitivity));
    if (!(lp.sensitivity >= 0.0) || !std::isfinite(lp.sensitivity))
      return bad(path, "layers[" + std::to_string(l) + "].sensitivity must be a finite number >= 0");
    MOELITE_TRY(f.real(jl, "sensitivity_fd", &lp.sensitivity_fd, false));
    MOELITE_TRY(f.real(jl, "mean_tail_weight", &lp.mean_tail_weight, false));
    if (const json::Value* counts = jl.find("expert_counts")) {
      std::vector<double> c;
      MOELITE_TRY(f.reals(*counts, static_cast<size_t>(p->n_expert), "expert_counts", &c));
      for (double x : c) {
        if (!(x >= 0.0) || x != std::floor(x) || x > 1e18) return bad(path, "expert_counts must be counts");
        lp.expert_counts.push_back(static_cast<uint64_t>(x));
      }
    }
    if (const json::Value* curve = jl.find("hit_curve")) {
      MOELITE_TRY(f.reals(*curve, static_cast<size_t>(p->n_expert) + 1, "hit_curve", &lp.hit_curve));
      for (double h : lp.hit_curve)
        if (!(h >= 0.0 && h <= 1.0)) return bad(path, "hit_curve values must lie in [0, 1]");
    }
  }
  return MOELITE_OK;
}

// The gating table, the predictors' accuracy per layer and the learned predictors' stride.
Status read_gating_and_accuracy(Fields& f, const std::string& path, const json::Value& root, Profile* p) {
  if (const json::Value* g = root.find("gating")) {
    if (!g->is_array()) return bad(path, "'gating' must be an array");
    for (const json::Value& row : g->array) {
      GatingPoint gp;
      if (!row.is_object()) return bad(path, "'gating' rows must be objects");
      MOELITE_TRY(f.real(row, "threshold", &gp.threshold));
      MOELITE_TRY(f.real(row, "experts_per_token", &gp.experts_per_token));
      MOELITE_TRY(f.real(row, "share_reduced", &gp.share_reduced));
      p->gating.push_back(gp);
    }
  }
  if (const json::Value* acc = root.find("predictor_accuracy")) {
    if (!acc->is_object()) return bad(path, "'predictor_accuracy' must be an object");
    for (const auto& kv : acc->object)
      MOELITE_TRY(f.reals(kv.second, static_cast<size_t>(p->n_layer), "predictor_accuracy", &p->accuracy[kv.first]));
  }
  if (root.find("learned_stride")) {
    int64_t v;
    MOELITE_TRY(f.integer(root, "learned_stride", 1, std::max(1, p->n_layer - 1), &v));
    p->learned_stride = static_cast<int32_t>(v);
  }

  return MOELITE_OK;
}

// The predictors' fitted weights: the tensors the JSON lists, read from the weights file beside it.
Status read_weights(Fields& f, const std::string& path, const json::Value& root, Profile* p) {
  // Predictor weights.
  const json::Value* tensors = root.find("tensors");
  const json::Value* weights_file = root.find("weights_file");
  if (tensors && tensors->is_array() && !tensors->array.empty()) {
    if (!weights_file || !weights_file->is_string() || weights_file->string.empty() ||
        weights_file->string.find('/') != std::string::npos)
      return bad(path, "'weights_file' must name a file beside the profile");
    const size_t slash = path.find_last_of('/');
    const std::string wpath =
        (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + weights_file->string;
    std::string blob;
    if (read_whole(wpath, &blob) != MOELITE_OK) return bad(path, "its weights file '" + wpath + "' cannot be read");
    if (blob.size() < 8 || memcmp(blob.data(), kWeightsMagic, 4) != 0)
      return bad(path, "'" + wpath + "' is not a moelite profile weights file");
    uint32_t wversion;
    memcpy(&wversion, blob.data() + 4, 4);
    if (wversion != Profile::kVersion) return bad(path, "'" + wpath + "' has an unsupported version");
    const uint64_t data_bytes = blob.size() - 8;
    p->learned.resize(static_cast<size_t>(p->n_layer));
    p->correlation.resize(static_cast<size_t>(std::max(0, p->n_layer - 1)));
    // The tensors a profile writes never share bytes, so their sizes add up to at most the file's:
    // checking that keeps the copying linear in the file however often a tensor list repeats itself.
    uint64_t listed_bytes = 0;
    for (const json::Value& jt : tensors->array) {
      if (!jt.is_object()) return bad(path, "'tensors' rows must be objects");
      const json::Value* name = jt.find("name");
      if (!name || !name->is_string()) return bad(path, "a tensor has no name");
      TensorRef t;
      t.name = name->string;
      MOELITE_TRY(f.integer(jt, "rows", 1, 1 << 24, &t.rows));
      MOELITE_TRY(f.integer(jt, "cols", 1, 1 << 24, &t.cols));
      int64_t off;
      MOELITE_TRY(f.integer(jt, "offset", 0, int64_t{1} << 50, &off));
      t.offset = static_cast<uint64_t>(off);
      const uint64_t bytes = static_cast<uint64_t>(t.rows) * static_cast<uint64_t>(t.cols) * sizeof(float);
      if (t.offset % sizeof(float) != 0 || t.offset > data_bytes || bytes > data_bytes - t.offset)
        return bad(path, "tensor '" + t.name + "' lies outside '" + wpath + "' (truncated weights file?)");
      listed_bytes += bytes;
      if (listed_bytes > data_bytes)
        return bad(path, "its tensors list more bytes than '" + wpath + "' holds (a tensor listed twice?)");
      std::vector<float> data(static_cast<size_t>(t.rows * t.cols));
      memcpy(data.data(), blob.data() + 8 + t.offset, bytes);
      for (float x : data)
        if (!std::isfinite(x)) return bad(path, "tensor '" + t.name + "' holds a non-finite value");
      auto linear = [&](LinearMap* m) -> Status {
        if (t.rows != p->n_expert || t.cols != p->n_embd + 1)
          return bad(path, "tensor '" + t.name + "' must be n_expert x (n_embd + 1)");
        m->rows = static_cast<int32_t>(t.rows);
        m->n_in = p->n_embd;
        m->w = std::move(data);
        return MOELITE_OK;
      };
      size_t layer = 0;
      auto layer_of = [&](const char* prefix, size_t limit) -> bool {
        const size_t n = strlen(prefix);
        if (t.name.compare(0, n, prefix) != 0 || t.name.size() == n || t.name.size() > n + 6) return false;
        for (size_t c = n; c < t.name.size(); ++c)
          if (t.name[c] < '0' || t.name[c] > '9') return false;
        layer = static_cast<size_t>(std::stoul(t.name.substr(n)));
        return layer < limit;
      };
      if (t.name == "first_layer") {
        MOELITE_TRY(linear(&p->first_layer));
      } else if (layer_of("learned.", p->learned.size())) {
        MOELITE_TRY(linear(&p->learned[layer]));
      } else if (layer_of("correlation.", p->correlation.size())) {
        if (t.rows != p->n_expert || t.cols != p->n_expert)
          return bad(path, "tensor '" + t.name + "' must be n_expert x n_expert");
        p->correlation[layer] = std::move(data);
      } else {
        return bad(path, "unknown tensor '" + t.name + "'");
      }
    }
  }
  return MOELITE_OK;
}

}  // namespace

Status Profile::load(const std::string& path, Profile* out) {
  std::string text;
  MOELITE_TRY(read_whole(path, &text));
  json::Value root;
  std::string error;
  if (!json::parse(text, &root, &error)) return bad(path, "not valid JSON (" + error + ")");
  if (!root.is_object()) return bad(path, "the document is not a JSON object");
  Fields f(path);
  Profile p;
  MOELITE_TRY(read_model(f, path, root, &p));
  MOELITE_TRY(read_layers(f, path, root, &p));
  MOELITE_TRY(read_gating_and_accuracy(f, path, root, &p));
  MOELITE_TRY(read_weights(f, path, root, &p));
  *out = std::move(p);
  return MOELITE_OK;
}

Status Profile::check_model(const HParams& hp) const {
  if (arch != hp.arch || n_layer != hp.n_layer || n_expert != hp.n_expert || n_expert_used != hp.n_expert_used ||
      n_embd != hp.n_embd)
    return fail(MOELITE_ERR_BAD_PROFILE,
                "the calibration profile was made for a %s model with %d layers, %d experts (top-%d), width %d; "
                "this model is %s with %d layers, %d experts (top-%d), width %d",
                arch.c_str(), n_layer, n_expert, n_expert_used, n_embd, hp.arch.c_str(), hp.n_layer, hp.n_expert,
                hp.n_expert_used, hp.n_embd);
  return MOELITE_OK;
}

}  // namespace moelite
