// The CPU kernels' instruction set (csrc/core/cpu_isa.h): the one this process runs (chosen when
// the module is imported) and those compiled in.
#include <nanobind/nanobind.h>

#include "cpu_isa.h"
#include "registry.h"

EMBEDLAB_PY_BINDINGS(cpu_isa) {
  m.attr("cpu_isa") = embedlab::cpu_isa_name(embedlab::cpu_isa());
  m.attr("cpu_isas_built") = embedlab::cpu_isas_built();
}
