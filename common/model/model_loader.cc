// Model::Load: finds every tensor of the architecture in a GGUF file or a Hugging Face
// directory, checks its type and shape against the config, and wires the weights up without
// copying the large matrices.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/substitute.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/model/arch/arch.h"
#include "common/model/model_internal.h"
#include "kernels/cpu/panels.h"

namespace riskkv {
namespace {

class TensorSource {
 public:
  TensorSource(const ModelFiles& files, std::string path) : files_(files), path_(std::move(path)) {}

  const TensorView* Find(const std::string& name) const {
    return files_.gguf ? files_.gguf->FindTensor(name) : files_.safetensors->FindTensor(name);
  }

  absl::StatusOr<const TensorView*> Require(const std::string& name) const {
    const TensorView* t = Find(name);
    if (t == nullptr)
      return absl::NotFoundError(absl::StrCat(path_, ": missing tensor '", name, "'"));
    return t;
  }

  absl::Status CheckShape(const TensorView& t, std::vector<int64_t> expected) const {
    if (t.shape != expected) {
      auto fmt = [](const std::vector<int64_t>& s) {
        std::string out = "[";
        for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? ", " : "", s[i]);
        return out + "]";
      };
      return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", t.name, "' has shape ",
                                                     fmt(t.shape), ", expected ", fmt(expected)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<WeightMatrix> Matrix(const std::string& name, int64_t rows, int64_t cols) const {
    ASSIGN_OR_RETURN(const TensorView* t, Require(name));
    RETURN_IF_ERROR(CheckShape(*t, {rows, cols}));
    return WeightMatrix{t->dtype, t->data, rows, cols};
  }

  // 1-D tensors (norms, biases) are small: they are converted to owned f32.
  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n) const {
    ASSIGN_OR_RETURN(const TensorView* t, Require(name));
    RETURN_IF_ERROR(CheckShape(*t, {n}));
    if (IsQuantized(t->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path_, ": tensor '", name, "' is ", DTypeName(t->dtype), ", expected a float type"));
    }
    std::vector<float> out(n);
    DequantizeRow(t->dtype, t->data, out.data(), n);
    return out;
  }

 private:
  const ModelFiles& files_;
  std::string path_;
};

// Rows [first, first + count) of a matrix, pointing into its data.
WeightMatrix RowRange(const WeightMatrix& w, int64_t first, int64_t count) {
  return WeightMatrix{w.dtype, w.row(first), count, w.cols};
}

bool LooksLikeGguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                                   const ModelOptions& options) {
  namespace fs = std::filesystem;
  if (const std::string missing = MissingCpuFeatures(); !missing.empty()) {
    return absl::FailedPreconditionError("this CPU lacks " + missing +
                                         ", which the CPU kernels need");
  }
  if (options.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("thread count ", options.threads, " is out of range (at most 1024)"));
  }
  std::error_code ec;
  if (!fs::exists(path, ec))
    return absl::NotFoundError(absl::StrCat("model path does not exist: ", path));

  auto model = std::unique_ptr<Model>(new Model());
  model->files_ = std::make_unique<ModelFiles>();
  WeightFormat format;
  TokenizerSpec spec;
  if (fs::is_directory(path, ec)) {
    format = WeightFormat::kHuggingFace;
    const fs::path dir(path);
    ASSIGN_OR_RETURN(model->config_, ConfigFromHfJson((dir / "config.json").string()));
    ASSIGN_OR_RETURN(model->files_->safetensors, SafetensorsShards::Open(dir.string()));
    ASSIGN_OR_RETURN(spec, Tokenizer::SpecFromTokenizerJson((dir / "tokenizer.json").string()));
    if (model->config_.name.empty() || model->config_.name == "llama" ||
        model->config_.name == "qwen2" || model->config_.name == "phi3") {
      model->config_.name = dir.filename().string();
    }
  } else if (LooksLikeGguf(path)) {
    format = WeightFormat::kGguf;
    ASSIGN_OR_RETURN(model->files_->gguf, GgufFile::Open(path));
    ASSIGN_OR_RETURN(model->config_, ConfigFromGguf(*model->files_->gguf));
    ASSIGN_OR_RETURN(spec, Tokenizer::SpecFromGguf(*model->files_->gguf));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a GGUF file (bad magic) and not a Hugging Face model directory"));
  }
  ModelConfig& c = model->config_;
  const TensorSource src(*model->files_, path);
  const ArchTensorNames& names = TensorNamesFor(c.arch, format);

  ASSIGN_OR_RETURN(const TensorView* embd, src.Require(names.token_embedding));
  if (embd->shape.size() == 2 && c.vocab == 0) c.vocab = embd->shape[0];
  RETURN_IF_ERROR(c.Validate());
  ASSIGN_OR_RETURN(model->token_embedding_, src.Matrix(names.token_embedding, c.vocab, c.hidden));
  // GGUF marks a tied head by leaving output.weight out (as llama.cpp reads it); a Hugging Face
  // config says so explicitly, and then a missing lm_head is a broken file, not a tied one.
  if (format == WeightFormat::kGguf) c.tied_embeddings = src.Find(names.lm_head) == nullptr;
  if (c.tied_embeddings) {
    model->lm_head_ = model->token_embedding_;
  } else {
    ASSIGN_OR_RETURN(model->lm_head_, src.Matrix(names.lm_head, c.vocab, c.hidden));
  }
  ASSIGN_OR_RETURN(model->output_norm_, src.Vector(names.output_norm, c.hidden));

  const LayerTensorNames& ln = names.layer;
  const int64_t q_width = c.n_heads * c.head_dim;
  c.qkv_bias = !ln.bq.empty();  // Qwen2 requires its Q/K/V biases
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto name = [l](const std::string& pattern) { return absl::Substitute(pattern, l); };
    Layer layer;
    ASSIGN_OR_RETURN(layer.attn_norm, src.Vector(name(ln.attn_norm), c.hidden));
    ASSIGN_OR_RETURN(layer.ffn_norm, src.Vector(name(ln.ffn_norm), c.hidden));
    if (!ln.wqkv.empty()) {
      ASSIGN_OR_RETURN(const WeightMatrix qkv,
                       src.Matrix(name(ln.wqkv), q_width + 2 * c.kv_width(), c.hidden));
      layer.wq = RowRange(qkv, 0, q_width);
      layer.wk = RowRange(qkv, q_width, c.kv_width());
      layer.wv = RowRange(qkv, q_width + c.kv_width(), c.kv_width());
    } else {
      ASSIGN_OR_RETURN(layer.wq, src.Matrix(name(ln.wq), q_width, c.hidden));
      ASSIGN_OR_RETURN(layer.wk, src.Matrix(name(ln.wk), c.kv_width(), c.hidden));
      ASSIGN_OR_RETURN(layer.wv, src.Matrix(name(ln.wv), c.kv_width(), c.hidden));
    }
    ASSIGN_OR_RETURN(layer.wo, src.Matrix(name(ln.wo), c.hidden, q_width));
    if (!ln.w_gate_up.empty()) {
      ASSIGN_OR_RETURN(const WeightMatrix gate_up,
                       src.Matrix(name(ln.w_gate_up), 2 * c.ffn, c.hidden));
      layer.w_gate = RowRange(gate_up, 0, c.ffn);
      layer.w_up = RowRange(gate_up, c.ffn, c.ffn);
    } else {
      ASSIGN_OR_RETURN(layer.w_gate, src.Matrix(name(ln.w_gate), c.ffn, c.hidden));
      ASSIGN_OR_RETURN(layer.w_up, src.Matrix(name(ln.w_up), c.ffn, c.hidden));
    }
    ASSIGN_OR_RETURN(layer.w_down, src.Matrix(name(ln.w_down), c.hidden, c.ffn));
    if (c.qkv_bias) {
      ASSIGN_OR_RETURN(layer.bq, src.Vector(name(ln.bq), q_width));
      ASSIGN_OR_RETURN(layer.bk, src.Vector(name(ln.bk), c.kv_width()));
      ASSIGN_OR_RETURN(layer.bv, src.Vector(name(ln.bv), c.kv_width()));
    }
    for (const WeightMatrix* w :
         {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w_gate, &layer.w_up, &layer.w_down}) {
      model->weight_bytes_ += w->rows * RowBytes(w->dtype, w->cols);
    }
    model->layers_.push_back(std::move(layer));
  }
  model->weight_bytes_ += c.vocab * RowBytes(model->token_embedding_.dtype, c.hidden);
  if (!c.tied_embeddings)
    model->weight_bytes_ += c.vocab * RowBytes(model->lm_head_.dtype, c.hidden);

  ASSIGN_OR_RETURN(model->tokenizer_, Tokenizer::Create(std::move(spec)));
  if (model->tokenizer_->vocab_size() > c.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tokenizer has ",
                                                   model->tokenizer_->vocab_size(),
                                                   " tokens but the model only ", c.vocab));
  }
  if (options.cpu_panels) {
    // Quantized panels serve 8-bit products; float ones any f32 product.
    const bool quantized = options.activations == ActivationPrecision::kInt8;
    model->AddPanels(model->lm_head_, quantized);
    for (Layer& layer : model->layers_) {
      for (WeightMatrix* w : {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w_gate,
                              &layer.w_up, &layer.w_down}) {
        model->AddPanels(*w, quantized);
      }
    }
  }
  model->backend_ = MakeCpuBackend(options.threads, options.activations);
  return model;
}

void Model::AddPanels(WeightMatrix& w, bool quantized) {
  if (!cpu::FitsPanels(w.dtype, w.rows, w.cols) || (IsQuantized(w.dtype) && !quantized)) return;
  panels_.push_back(cpu::PackPanels(w.dtype, w.data, w.rows, w.cols));
  w.panels = panels_.back().get();
  // The panels are the copy the products read: the file's pages of these rows leave the
  // resident set (a GGUF's matrices point into its read-only mapping).
  if (files_->gguf != nullptr) {
    DropMappedPages(w.data, static_cast<uint64_t>(w.rows * RowBytes(w.dtype, w.cols)));
  }
}

}  // namespace riskkv
