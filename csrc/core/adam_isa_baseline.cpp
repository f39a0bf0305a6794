// The Adam loops for the baseline instruction set (compile flags set in CMakeLists.txt).
#define RZ_ISA_NS adam_baseline
#define RZ_TABLE_FN adam_table_baseline
#include "adam_kernels.inc"
