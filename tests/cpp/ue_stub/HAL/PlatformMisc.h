// stub: see UEStub.h
#pragma once
#include "UEStub.h"
