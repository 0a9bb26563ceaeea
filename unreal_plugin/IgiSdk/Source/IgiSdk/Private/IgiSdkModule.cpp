#include "IgiSidecarHost.h"
#include "Modules/ModuleManager.h"

// The module owns the process's sidecar (FIgiSidecarHost): game instances come and go (PIE
// sessions, two PIE players at once) and use it; the module's end lets it go.
class FIgiSdkModule : public IModuleInterface
{
public:
	virtual void ShutdownModule() override
	{
		FIgiSidecarHost::Get().Shutdown();
	}
};

IMPLEMENT_MODULE(FIgiSdkModule, IgiSdk);
