// The C interface of zest_sentencepiece, the module that holds Debian's
// libsentencepiece apart from the rest of the process.
//
// Why a module: libsentencepiece exports the protobuf it embeds (1602
// google::protobuf symbols in 0.1.97). Linked into a program that also
// loads libprotobuf (libtorch does, through ONNX), the dynamic linker binds
// libprotobuf's own calls to sentencepiece's copies and the program crashes
// before main. sentencepiece_library.cpp opens this module with RTLD_LOCAL
// (its symbols stay out of the global scope) and RTLD_DEEPBIND (its calls
// bind to its own protobuf first), and reaches it only through these
// functions. Errors come back as text in `error` (at most `capacity` bytes).
#pragma once

#include <cstddef>

extern "C" {

// A processor of the serialized model, or nullptr with the reason.
void* zest_spm_load(const char* model, size_t bytes, char* error, size_t capacity);
void zest_spm_free(void* processor);
// The ids of `text`, handed to `sink` (called once); 0 on success.
int zest_spm_encode(const void* processor, const char* text, size_t bytes,
                    void (*sink)(void* context, const int* ids, size_t count), void* context, char* error,
                    size_t capacity);
int zest_spm_piece_size(const void* processor);
// The id of `piece`, or -1 when it is not a piece of the model.
int zest_spm_piece_to_id(const void* processor, const char* piece, size_t bytes);
// Piece `id`'s text (valid while the processor lives); nullptr outside the model.
const char* zest_spm_id_to_piece(const void* processor, int id, size_t* bytes);
int zest_spm_bos_id(const void* processor);
int zest_spm_eos_id(const void* processor);
int zest_spm_unk_id(const void* processor);

}  // extern "C"
