// The core is a plain C++ library; inside Unreal it still needs a module to be linked.
#ifdef IGI_SDK_UNREAL_MODULE
#include "Modules/ModuleManager.h"
IMPLEMENT_MODULE(FDefaultModuleImpl, IgiSdkCore);
#endif
