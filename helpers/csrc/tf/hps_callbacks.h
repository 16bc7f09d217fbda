// The C callbacks through which the EmbedLabHpsLookup kernels reach the parameter server
// (embedlab.hps.ParameterServer, Python). embedlab/hps/layers.py registers both at import with
// ctypes; the setters are defined in hps_kernels.cc (always compiled), so a CPU build accepts
// the device callback too and Python registers the same pair everywhere.
#pragma once

#include <cstdint>

extern "C" {
// Host kernel: host int64 keys -> host rows. Returns 0 on success; otherwise writes a
// NUL-terminated message into err (err_len bytes).
typedef int (*EmbedLabHpsLookupFn)(const char* ps_config_file, const char* model_name, int64_t table_id,
                                   int64_t global_batch_size, const int64_t* keys, int64_t n, float* out,
                                   int64_t dim, char* err, int64_t err_len);

// GPU kernel: device keys (key_bytes 8: int64, 4: int32) on CUDA device `device` -> the device
// buffer `out` ([n, dim] float32) on that device. `stream` is TensorFlow's cudaStream_t of the
// op: the keys are ready in its order, and TensorFlow reads `out` in its order. Returns 0 when
// it filled `out` (the server's GPU tier), 1 on error (message in err), or
// kEmbedLabHpsHostPath when the table is not on the GPU tier of `device` (err then says why):
// the kernel then serves the lookup through the host callback (one device-to-host copy of the
// keys, one host-to-device copy of the rows).
typedef int (*EmbedLabHpsDeviceLookupFn)(const char* ps_config_file, const char* model_name, int64_t table_id,
                                         int64_t global_batch_size, const void* keys, int64_t key_bytes, int64_t n,
                                         float* out, int64_t dim, int64_t device, void* stream, char* err,
                                         int64_t err_len);

enum { kEmbedLabHpsHostPath = 2 };

// The registered callbacks, or nullptr (read by hps_kernels_gpu.cc).
EmbedLabHpsLookupFn embedlab_hps_lookup_callback();
EmbedLabHpsDeviceLookupFn embedlab_hps_device_lookup_callback();
}
