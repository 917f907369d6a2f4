// The CUDA runtime header as the CPU emulation provides it (tests only; see ../cuemu.h).
#pragma once
#include "../cuemu.h"
