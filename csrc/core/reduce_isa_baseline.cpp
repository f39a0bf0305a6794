// The reduction loops for the baseline instruction set (compile flags set in CMakeLists.txt).
#define RZ_ISA_NS isa_baseline
#define RZ_TABLE_FN reduce_table_baseline
#include "reduce_kernels.inc"
