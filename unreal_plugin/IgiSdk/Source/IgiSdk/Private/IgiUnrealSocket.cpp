#include "IgiUnrealSocket.h"

#include <chrono>
#include <cstddef>
#include <cstring>

#include "IPAddress.h"
#include "Sockets.h"
#include "SocketSubsystem.h"

namespace
{
	// the reader's longest single FSocket::Wait: it only bounds how late a close is noticed where
	// Shutdown does not end the wait; arriving bytes end it at once
	constexpr int32 ReaderSliceMs = 250;
	constexpr size_t ReadChunkBytes = 64 * 1024;
	// the reader stops reading while this much waits for the I/O thread (TCP then holds the rest)
	constexpr size_t MaxPendingBytes = 4 * 1024 * 1024;
}

FIgiUnrealSocket::~FIgiUnrealSocket()
{
	Close();
}

bool FIgiUnrealSocket::Connect(const std::string& Host, uint16_t Port, int TimeoutMs, std::string& Error)
{
	Close();
	ISocketSubsystem* Subsystem = ISocketSubsystem::Get(PLATFORM_SOCKETSUBSYSTEM);
	if (Subsystem == nullptr)
	{
		Error = "no socket subsystem";
		return false;
	}
	TSharedRef<FInternetAddr> Address = Subsystem->CreateInternetAddr();
	bool bValid = false;
	Address->SetIp(UTF8_TO_TCHAR(Host.c_str()), bValid);
	if (!bValid)
	{
		Error = "not an IP address: " + Host;
		return false;
	}
	Address->SetPort(Port);
	Socket = Subsystem->CreateSocket(NAME_Stream, TEXT("igi-sdk"), Address->GetProtocolType());
	if (Socket == nullptr)
	{
		Error = "cannot create a socket";
		return false;
	}
	Socket->SetNoDelay(true);
	Socket->SetNonBlocking(true);
	Socket->Connect(*Address);
	if (!Socket->Wait(ESocketWaitConditions::WaitForWrite, FTimespan::FromMilliseconds(TimeoutMs))
		|| Socket->GetConnectionState() != SCS_Connected)
	{
		Error = "connection refused or timed out";
		Close();
		return false;
	}
	{
		// a Wake() that came while connecting stays set: the request it announced is still queued
		std::lock_guard<std::mutex> Lock(Mutex);
		Pending.clear();
		PendingAt = 0;
		bClosed = false;
		bStopping = false;
	}
	Reader = std::thread([this]() { ReadLoop(); });
	return true;
}

bool FIgiUnrealSocket::SendAll(const uint8_t* Data, size_t Count, int TimeoutMs)
{
	size_t Sent = 0;
	while (Sent < Count)
	{
		if (Socket == nullptr)
		{
			return false;
		}
		int32 Chunk = 0;
		const int32 Want = static_cast<int32>(FMath::Min<size_t>(Count - Sent, 1 << 20));
		if (!Socket->Send(Data + Sent, Want, Chunk))
		{
			return false;
		}
		if (Chunk > 0)
		{
			Sent += static_cast<size_t>(Chunk);
			continue;
		}
		if (!Socket->Wait(ESocketWaitConditions::WaitForWrite, FTimespan::FromMilliseconds(TimeoutMs)))
		{
			return false;
		}
	}
	return true;
}

int FIgiUnrealSocket::Recv(uint8_t* Buffer, size_t Capacity, int TimeoutMs)
{
	std::unique_lock<std::mutex> Lock(Mutex);
	auto Ready = [this]() { return PendingAt < Pending.size() || bClosed || bWoken; };
	if (!Ready())
	{
		Arrived.wait_for(Lock, std::chrono::milliseconds(TimeoutMs < 0 ? 0 : TimeoutMs), Ready);
	}
	bWoken = false;
	const size_t Buffered = Pending.size() - PendingAt;
	if (Buffered > 0)
	{
		// what arrived before a close is delivered first; the close is seen on the next call
		const size_t Count = FMath::Min<size_t>(FMath::Min<size_t>(Capacity, Buffered), 1 << 30);
		std::memcpy(Buffer, Pending.data() + PendingAt, Count);
		PendingAt += Count;
		if (PendingAt == Pending.size())
		{
			Pending.clear();  // keeps its capacity
			PendingAt = 0;
			Drained.notify_one();
		}
		return static_cast<int>(Count);
	}
	return bClosed ? -1 : 0;
}

void FIgiUnrealSocket::Wake()
{
	{
		std::lock_guard<std::mutex> Lock(Mutex);
		bWoken = true;
	}
	Arrived.notify_one();
}

void FIgiUnrealSocket::MarkClosed()
{
	{
		std::lock_guard<std::mutex> Lock(Mutex);
		bClosed = true;
	}
	Arrived.notify_one();
}

void FIgiUnrealSocket::ReadLoop()
{
	std::vector<uint8_t> Chunk(ReadChunkBytes);
	while (true)
	{
		{
			// a game thread that stops draining does not make the buffer grow without bound
			std::unique_lock<std::mutex> Lock(Mutex);
			Drained.wait(Lock, [this]() { return bStopping || Pending.size() - PendingAt < MaxPendingBytes; });
			if (bStopping)
			{
				return;
			}
		}
		// blocks until bytes arrive, the peer closes, Close() shuts the socket down, or the slice ends
		const bool bReadable = Socket->Wait(ESocketWaitConditions::WaitForRead, FTimespan::FromMilliseconds(ReaderSliceMs));
		if (!bReadable)
		{
			if (Socket->GetConnectionState() == SCS_ConnectionError)
			{
				MarkClosed();
				return;
			}
			continue;
		}
		int32 Read = 0;
		// readable with no bytes: the peer closed (a graceful close also makes Recv return false)
		if (!Socket->Recv(Chunk.data(), static_cast<int32>(Chunk.size()), Read)
			|| (Read == 0 && Socket->GetConnectionState() != SCS_Connected))
		{
			MarkClosed();
			return;
		}
		if (Read > 0)
		{
			{
				std::lock_guard<std::mutex> Lock(Mutex);
				if (PendingAt > 0)
				{
					// drop what Recv already took before appending (the buffer keeps its capacity)
					Pending.erase(Pending.begin(), Pending.begin() + static_cast<std::ptrdiff_t>(PendingAt));
					PendingAt = 0;
				}
				Pending.insert(Pending.end(), Chunk.data(), Chunk.data() + Read);
			}
			Arrived.notify_one();
		}
	}
}

void FIgiUnrealSocket::Close()
{
	{
		std::lock_guard<std::mutex> Lock(Mutex);
		bStopping = true;
		bClosed = true;
	}
	Drained.notify_all();
	Arrived.notify_all();
	if (Socket != nullptr && Reader.joinable())
	{
		// ends the reader's Wait now rather than at the end of its slice
		Socket->Shutdown(ESocketShutdownMode::ReadWrite);
	}
	if (Reader.joinable())
	{
		Reader.join();
	}
	if (Socket != nullptr)
	{
		Socket->Close();
		ISocketSubsystem::Get(PLATFORM_SOCKETSUBSYSTEM)->DestroySocket(Socket);
		Socket = nullptr;
	}
	std::lock_guard<std::mutex> Lock(Mutex);
	Pending.clear();
	PendingAt = 0;
}
