// torch_module_io.h: the engine's I/O, and the module's view brought up to
// date after whatever changed the values.
#include "zest/torch/torch_module_io.h"

namespace zest {

std::string save_checkpoint(TorchModule& tm, const std::string& root, const CheckpointOptions& options) {
  return save_checkpoint(tm.engine(), root, options);
}

std::string load_checkpoint(TorchModule& tm, const std::string& root, const CheckpointOptions& options) {
  std::string tag = load_checkpoint(tm.engine(), root, options);
  tm.values_changed();
  return tag;
}

void export_weights(TorchModule& tm, const std::string& path, const WeightsExportOptions& options) {
  export_weights(tm.engine(), path, options);
}

void import_weights(TorchModule& tm, const std::string& path, const WeightsImportOptions& options) {
  import_weights(tm.engine(), path, options);
  tm.values_changed();
}

HfImportReport import_hf(TorchModule& tm, const std::string& dir, const HfImportOptions& options) {
  HfImportReport r = import_hf(tm.engine(), dir, options);
  tm.values_changed();
  return r;
}

HfExportReport export_hf(TorchModule& tm, const std::string& dir, const HfExportOptions& options) {
  return export_hf(tm.engine(), dir, options);
}

// The members of the same names.
std::string TorchModule::save(const std::string& root) { return save_checkpoint(*this, root); }
std::string TorchModule::save(const std::string& root, const CheckpointOptions& options) {
  return save_checkpoint(*this, root, options);
}
std::string TorchModule::load(const std::string& root) { return load_checkpoint(*this, root); }
std::string TorchModule::load(const std::string& root, const CheckpointOptions& options) {
  return load_checkpoint(*this, root, options);
}
void TorchModule::export_safetensors(const std::string& path, DType dtype) {
  WeightsExportOptions o;
  o.dtype = dtype;
  export_weights(*this, path, o);
}
void TorchModule::import_safetensors(const std::string& path) { import_weights(*this, path); }
void TorchModule::import_safetensors(const std::string& path, const WeightsImportOptions& options) {
  import_weights(*this, path, options);
}
HfImportReport TorchModule::import_hf(const std::string& dir) { return zest::import_hf(*this, dir); }
HfImportReport TorchModule::import_hf(const std::string& dir, const HfImportOptions& options) {
  return zest::import_hf(*this, dir, options);
}
HfExportReport TorchModule::export_hf(const std::string& dir) { return zest::export_hf(*this, dir); }
HfExportReport TorchModule::export_hf(const std::string& dir, const HfExportOptions& options) {
  return zest::export_hf(*this, dir, options);
}

}  // namespace zest
