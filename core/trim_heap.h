// Handing freed heap memory back to the operating system.
//
// glibc keeps freed blocks of a few MiB in its heaps instead of unmapping
// them (its mmap threshold rises to the largest block freed), so a process
// that holds one unit of a model at a time, a different size each, would
// see its resident memory grow towards every unit it ever held. Code that
// streams a model unit by unit (deferred construction, Hugging Face import
// and export) calls trim_heap() after each unit, so that resident memory
// follows what is live. A no-op where the C library has no malloc_trim,
// and under a sanitizer, whose allocator is not glibc's.
#pragma once

namespace zest {

void trim_heap();

}  // namespace zest
